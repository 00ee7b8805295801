#!/usr/bin/env bash
# Quick start, step 2 of 2: builds what changed and runs the whole test suite (CPU tests always;
# GPU tests run where a GPU is, and skip where there is none: the reasons are listed after the run).
# Configures as quickstart.sh does (again when nvcc appeared or went away since).
# Extra arguments go to ctest, e.g.  scripts/test.sh -L 01_safe_softmax
set -euo pipefail
cd "$(dirname "$0")/.."
FL_SCRIPT=test
source scripts/setup.sh

fl_configure
fl_build
status=0
ctest_out=$(mktemp "${TMPDIR:-/tmp}/flash_ladder_ctest.XXXXXX")
trap 'rm -f "$ctest_out"' EXIT
ctest --test-dir "$FL_BUILD_DIR" --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" "$@" | tee "$ctest_out" ||
  status=$?

# ctest prints only "Skipped" for a skipped test; the reason GTEST_SKIP gave is in its output, which
# ctest keeps in LastTest.log. One line per reason, with how many tests and a few of their names.
log="$FL_BUILD_DIR/Testing/Temporary/LastTest.log"
if [ -f "$log" ]; then
  awk '
    /^[0-9]+\/[0-9]+ Test: / { name = $0; sub(/^[0-9]+\/[0-9]+ Test: /, "", name); want = 0; reason = ""; next }
    / Skipped$/ { want = 1; next }
    want == 1 { reason = $0; want = 0; next }
    /^\[  SKIPPED \] / && name != "" && !(name in seen) {
      seen[name] = 1
      r = (reason == "" ? "(no reason given)" : reason)
      if (!(r in count)) order[n++] = r
      count[r]++
      if (count[r] <= 3) names[r] = names[r] (count[r] > 1 ? ", " : "") name
    }
    # Reasons that end with a shorter one ("no Backend::Cuda rung 01_safe_softmax: <why>") are
    # counted under it (<why>): one line per cause, not per rung.
    END {
      total = 0
      for (i = 0; i < n; i++) {
        r = order[i]; key = r
        for (j = 0; j < n; j++) {
          s = order[j]
          if (length(s) < length(key) && substr(r, length(r) - length(s) + 1) == s) key = s
        }
        if (!(key in kcount)) korder[m++] = key
        kcount[key] += count[r]
        if (kshown[key] < 3) {
          knames[key] = knames[key] (kshown[key] > 0 ? ", " : "") names[r]
          kshown[key] += (count[r] < 3 ? count[r] : 3)
        }
        total += count[r]
      }
      if (total == 0) exit
      printf "test: %d test%s skipped, and why:\n", total, (total > 1 ? "s" : "")
      for (i = 0; i < m; i++) {
        key = korder[i]
        printf "  %d skipped: %s (%s%s)\n", kcount[key], key, knames[key], (kcount[key] > kshown[key] ? ", ..." : "")
      }
    }' "$log"
fi
# The closing line, with the skipped tests counted apart (ctest counts them as passed).
read -r failed total < <(sed -n 's/.* tests passed, \([0-9]*\) tests\{0,1\} failed out of \([0-9]*\).*/\1 \2/p' "$ctest_out" | tail -n1)
if [ -n "${total:-}" ]; then
  skipped=$(grep -c '(Skipped)$' "$ctest_out" || true)
  echo "test: $((total - failed - skipped)) passed, $failed failed, $skipped skipped"
fi
exit "$status"
